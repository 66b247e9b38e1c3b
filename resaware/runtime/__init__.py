"""What runs with the TVM runtime alone (the deploy install): a compiled module called, timed under a
budget and loaded back, and built candidates measured on a GPU machine that has no TVM compiler."""
