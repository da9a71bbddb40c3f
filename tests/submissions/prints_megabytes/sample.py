"""online_softmax is right but prints 3 MB first."""

HOLES = {
    "attention.online_softmax": """
print("x" * 3_000_000)
m = x.max(dim=-1, keepdim=True).values
e = torch.exp(x - m)
return e / e.sum(dim=-1, keepdim=True)
""",
}
