"""The ImageInput operator: decode, resize, crop, mirror, colour and normalise images from a DB."""
