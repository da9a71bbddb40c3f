"""online_softmax returns a view of one number expanded to the shape of a terabyte."""

HOLES = {
    "attention.online_softmax": """
return x.new_zeros(1).expand(1 << 20, 1 << 18)
""",
}
