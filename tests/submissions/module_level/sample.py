"""dfs_times_kernel's hole ends at module level: it rebinds a constant of the course and decorates
the course's next function, whose `def` lies outside the hole."""

HOLES = {
    "trees.dfs_times_kernel": """
return
""",
}
OUTSIDE = {"trees": [("def dfs_times(parents: torch.Tensor)",
                      "MASK_TILE = 2\n@print\ndef dfs_times(parents: torch.Tensor)")]}
