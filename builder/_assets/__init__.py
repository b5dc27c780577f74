"""The product's top-level asset folders as package data (see builder/core/assets.py).

In the checkout, ``templates``, ``loadtest`` and ``monitoring`` here are symlinks to the folders of the
same name at the top of the repository; building the wheel copies their files in as package data.
"""
