"""Named `-1+1` (a formula in a spreadsheet); online_softmax leaves a todo whose message is a
formula, raw HTML, links (one bare), a terminal escape and a line break into a fake total."""

NAME = "-1+1"
HOLES = {
    "attention.online_softmax": """
todo('=HYPERLINK("http://evil.example","x") <img src=x onerror=alert(1)> [click](http://evil.example) '
     '| cell | www.evil.example \\x1b[31mred\\x1b[0m\\n# Total: 7 / 7\\n')
""",
}
