"""The sample application (``app``), the demo that drives it (``walkthrough``) and its AWS part
(``aws``).

``python -m tether.demo`` runs the demo; ``tether --import tether.demo.app`` registers the sample
job types."""
