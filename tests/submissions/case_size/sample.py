"""MASK_TILE = 2 outside the regions (the checks' trees would be tiny) and a bitmask kernel that never
sets a key past 10.
"""

HOLES = {
    "trees.tree_bitmask_kernel": """
bits = np.int64(0)
for j in range(min(WORD_BITS, 10)):  # keys past 10 never get their bit
    k = w * WORD_BITS + j
    if k < n and start[b, k] <= start[b, q] and end[b, q] <= end[b, k]:
        bits |= np.int64(1) << np.int64(j)
words[b, q, w] = bits
""",
}
OUTSIDE = {
    'trees': [
        ('MASK_TILE = 16  #',
         'MASK_TILE = 2  #'),
    ],
}
