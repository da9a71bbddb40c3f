"""online_softmax crashes the interpreter (reads address 0)."""

HOLES = {
    "attention.online_softmax": """
import ctypes
return ctypes.string_at(0)
""",
}
