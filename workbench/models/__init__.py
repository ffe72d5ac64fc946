"""Model zoo (layer-sequential models at paper and mini size) and offline data sets.

>>> from workbench.models import build, load_dataset
>>> model = build("vgg16", "mini")                 # 16 layers, 8x8x1 digits, 10 classes
>>> train = load_dataset(model.dataset, "train")   # TensorDataset(x, y), no download
"""

from workbench.models.base import LayerModel, TensorSpec
from workbench.models.data import dataset_info, load_dataset, synthetic
from workbench.models.zoo import SIZES, build, config, list_models

__all__ = [
    "LayerModel",
    "TensorSpec",
    "build",
    "config",
    "list_models",
    "SIZES",
    "load_dataset",
    "dataset_info",
    "synthetic",
]
