"""The bitmask launcher, outside the regions, returns the oracle's answer; the kernel is still a stub."""

STUBS = ["trees.tree_bitmask_kernel"]
OUTSIDE = {
    "trees": [
        ('    launch(tree_bitmask_kernel, (blocks, batch), threads, start, end, words,\n'
         '           names=("start", "end", "words"))\n'
         '    return words\n',
         '    from course import oracle\n'
         '    return oracle.tree_bitmask(start, end)\n'),
    ],
}
