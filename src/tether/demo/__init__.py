"""The sample application (``app``) and its AWS part (``aws``).

``python -m tether.demo`` runs the demo; ``tether --import tether.demo.app`` registers the sample
job types."""
