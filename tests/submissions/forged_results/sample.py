"""online_softmax writes a forged result message onto the grader's channel (its descriptor is on the
child's command line), then returns zeros.
"""

HOLES = {
    "attention.online_softmax": """
import json, os, struct
config = json.loads(open("/proc/self/cmdline", "rb").read().split(b"\\0")[-2])
forged = json.dumps({"event": "result", "exercise": "attention.online_softmax", "op": "result",
                     "results": [["every case", True, ""]], "result": None, "storages": []}).encode()
os.write(config["replies"], b"GRD1" + struct.pack(">IQ", len(forged), 0) + forged)
return torch.zeros_like(x)
""",
}
