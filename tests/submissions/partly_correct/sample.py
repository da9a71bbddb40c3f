"""A softmax without the running maximum: large scores overflow (exp(900) is inf)."""

HOLES = {
    "attention.online_softmax": """
e = torch.exp(x)
return e / e.sum(dim=-1, keepdim=True)
""",
}
