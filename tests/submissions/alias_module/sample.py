"""online_softmax names torch through a local alias, past which a list of forbidden names would not
look again, and calls its softmax."""

HOLES = {
    "attention.online_softmax": """
t = torch
return t.softmax(x, dim=-1)
""",
}
