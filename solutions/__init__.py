"""Reference solutions: the complete kernels and launchers of the course.

`lessons/` is generated from this package by `python -m course release`; exercise
regions sit between `### BEGIN SOLUTION` and `### END SOLUTION`.
"""
