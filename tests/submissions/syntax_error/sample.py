"""dfs_times_kernel's code does not parse (a missing colon)."""

HOLES = {
    "trees.dfs_times_kernel": """
for i in range(n)
    end[b, i] = 1
""",
}
