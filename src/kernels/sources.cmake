# Sources of the kernels layer (owned by that layer; keeps merges of parallel work apart).
