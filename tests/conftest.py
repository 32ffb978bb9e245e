import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

# The test models are tiny: one thread is faster, and far faster on a busy machine, where
# oversubscribed intra-op threads slow small ops by an order of magnitude.
torch.set_num_threads(1)
