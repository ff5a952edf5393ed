# Sources of the io layer (owned by that layer; keeps merges of parallel work apart).
