"""online_softmax puts what the child can see into its error message: uid, environment, command line,
folders, and whether the network answers.
"""

HOLES = {
    "attention.online_softmax": """
import os
import socket
import sys
try:
    socket.create_connection(("127.0.0.1", @PORT@), timeout=2).close()
    net = "connected"
except OSError as error:
    net = f"no network ({error})"
raise ValueError(f"uid={os.getuid()} env={sorted(os.environ.items())} argv={sys.argv[1:]} "
                 f"cwd={os.getcwd()} root={sorted(os.listdir('/'))} net={net}")
""",
}
