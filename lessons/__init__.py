# Student copy, generated from solutions/__init__.py by `python -m course release`.
# Write your code where a todo(...) line stands; everything else matches the solution.
"""Reference solutions: the complete kernels and launchers of the course.

`lessons/` is generated from this package by `python -m course release`; exercise
regions sit between `### BEGIN SOLUTION` and `### END SOLUTION`.
"""
