"""Named `-1+1`; online_softmax raises an error whose text is a spreadsheet formula, raw HTML and a
markdown link.
"""

NAME = '-1+1'
HOLES = {
    "attention.online_softmax": """
raise ValueError('=HYPERLINK("http://evil.example","x") <img src=x onerror=alert(1)> '
                 '[click](http://evil.example) | cell |')
""",
}
