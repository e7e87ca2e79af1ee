"""The model users hold, its StableHLO export, and the artifact directory (save / load). Torch-free."""
