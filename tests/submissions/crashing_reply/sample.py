"""online_softmax writes `[]` onto the grader's channel, then returns zeros."""

HOLES = {
    "attention.online_softmax": """
import json, os
config = json.loads(open("/proc/self/cmdline", "rb").read().split(b"\\0")[-2])
os.write(config["replies"], b"[]\\n")
return torch.zeros_like(x)
""",
}
