# Sources of the train layer (owned by that layer; keeps merges of parallel work apart).
