"""online_softmax forks three children that hold 700 MB each (once), then returns the right answer."""

HOLES = {
    "attention.online_softmax": """
import os
import time
if not os.path.exists("/tmp/forked"):
    open("/tmp/forked", "w").close()
    for _ in range(3):
        if os.fork() == 0:
            block = bytearray(700 << 20)
            for i in range(0, len(block), 4096):
                block[i] = 1
            time.sleep(60)
            os._exit(0)
    time.sleep(5)
m = x.max(dim=-1, keepdim=True).values
e = torch.exp(x - m)
return e / e.sum(dim=-1, keepdim=True)
""",
}
