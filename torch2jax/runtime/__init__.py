"""The model users hold, its StableHLO export, the artifact directory and manifest (save / load), the
Orbax checkpoint of its params, and their sharding plan on a mesh. Torch-free."""
