"""Measuring on a GPU and keeping the numbers: timing, the results files, statistics, the figure style."""
