"""Write a tiny synthetic COCO-format dataset where Detectron's dataset catalog looks for
COCO 2014 (``<detectron>/detectron/datasets/data/coco``):

    python tests/detectron/make_synthetic_coco.py DETECTRON_ROOT [--images 8] [--size 96]

Each image holds a few filled rectangles on noise; every rectangle is an instance with a box,
a polygon mask, an area and one of 80 categories, so Faster R-CNN, Mask R-CNN and RetinaNet
configs (NUM_CLASSES 81) train on it.  The same images serve coco_2014_train, _val,
_minival and _valminusminival (the datasets Detectron's configs name).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image

CATEGORIES = [{"id": i, "name": f"thing{i}", "supercategory": "thing"} for i in range(1, 81)]


def _image(rng: np.random.Generator, size: int) -> tuple[np.ndarray, list[dict]]:
    pixels = rng.integers(0, 60, (size, size, 3)).astype(np.uint8)
    anns = []
    for _ in range(int(rng.integers(1, 4))):
        w, h = (int(v) for v in rng.integers(size // 6, size // 2, 2))
        x, y = int(rng.integers(0, size - w)), int(rng.integers(0, size - h))
        category = int(rng.integers(1, 81))
        pixels[y:y + h, x:x + w] = rng.integers(120, 255, 3)
        polygon = [x, y, x + w, y, x + w, y + h, x, y + h]
        anns.append({"bbox": [x, y, w, h], "area": float(w * h), "category_id": category,
                     "iscrowd": 0, "segmentation": [[float(v) for v in polygon]]})
    return pixels, anns


def write(root: Path, images: int, size: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    data = root / "detectron" / "datasets" / "data" / "coco"
    ann_dir = data / "annotations"
    ann_dir.mkdir(parents=True, exist_ok=True)
    entries, annotations = [], []
    for image_id in range(1, images + 1):
        pixels, anns = _image(rng, size)
        file_name = f"COCO_synthetic_{image_id:012d}.jpg"
        entries.append({"id": image_id, "file_name": file_name, "width": size,
                        "height": size})
        for ann in anns:
            annotations.append({**ann, "id": len(annotations) + 1, "image_id": image_id})
        for split in ("coco_train2014", "coco_val2014"):
            (data / split).mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(data / split / file_name, quality=95)
    body = {"images": entries, "annotations": annotations, "categories": CATEGORIES,
            "info": {"description": "dpgraph synthetic COCO"}, "licenses": []}
    for name in ("instances_train2014.json", "instances_val2014.json",
                 "instances_minival2014.json", "instances_valminusminival2014.json"):
        (ann_dir / name).write_text(json.dumps(body))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--size", type=int, default=96)
    args = parser.parse_args()
    write(args.root, args.images, args.size)


if __name__ == "__main__":
    main()
