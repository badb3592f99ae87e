"""``python -m example_project``: the Django shop demo (see ``example_project.django_shop``)."""

import sys

from .django_shop import main

if __name__ == "__main__":
    sys.exit(main())
