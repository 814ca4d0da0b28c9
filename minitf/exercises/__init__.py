"""Exercises: each file holds one layer with its forward written and its backward left
for you (docs/exercises.md). Copy one and check it:

    python -m minitf.exercise list
    python -m minitf.exercise start layernorm        # writes ./layernorm.py
    python -m minitf.exercise check layernorm.py

The library's own layers are the solutions (minitf/layers.py, attention.py, loss.py).
"""
