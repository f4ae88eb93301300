"""Pure logic with no I/O: ids, time formats, names, limits, state rules."""
