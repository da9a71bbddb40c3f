"""The capstone (notebook 19): a small target and draft transformer, their generated corpus and
trained weights, and a tree speculative decoder built from the course's kernels."""
