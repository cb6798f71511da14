"""`python -m nanovllm`: the command line (as `nanovllm`), which `torchrun -m nanovllm` also runs."""

from nanovllm.cli import main

raise SystemExit(main())
