"""vramlab's own reference models, as the code pane writes them."""
