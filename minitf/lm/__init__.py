"""Language modelling with the decoder-only GPT: text data, the default text corpus, sampling."""
