# Tests of the model layer: meshtrain_add_test(...) lines.
