"""The lessons folder itself is a link to the grader's solutions/."""

LINKS = {'lessons': 'solutions'}
BARE = True
