"""online_softmax zeroes its input, then returns the softmax of zeros (a check that computed its
reference from the input after the call would agree).
"""

HOLES = {
    "attention.online_softmax": """
x[:] = 0.0
return torch.full_like(x, 1.0 / x.shape[-1])
""",
}
