"""officellm: the repository root is the `officellm` package.

Each top-level folder (app/, engine/, kernels/, admin_ui/, loadgen/, migrations/, installer/)
is installed as a sub-package of this one (`officellm.engine`, ...) through setup.py's
package-dir mapping, so nothing of ours takes a generic top-level import name that another
package owns (Hugging Face's `kernels`, which transformers imports). See docs/design.md,
§12, "One `officellm` namespace".
"""
