def from_pretrained(*a): raise NotImplementedError
def save_pretrained(*a): raise NotImplementedError
