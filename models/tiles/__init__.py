"""Tiled inference for image-to-image models: the receptive radius, the tile plan, pasting and feathered seams (numpy only)."""
