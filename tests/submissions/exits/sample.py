"""online_softmax ends the process."""

HOLES = {
    "attention.online_softmax": """
import os
os._exit(3)
""",
}
