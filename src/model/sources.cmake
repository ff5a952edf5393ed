# Sources of the model layer (owned by that layer; keeps merges of parallel work apart).
