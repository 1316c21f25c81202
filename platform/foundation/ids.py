"""Object ids as forms and JSON bodies write them."""

from __future__ import annotations

import re

# An id written as text: ASCII digits that int() reads (str.isdigit() also says yes to
# "²", and int() refuses more than 4300 digits); 19 hold every positive bigint.
ID_TEXT = re.compile(r"[0-9]{1,19}")
