"""``jaxrun -i``: the session over any launch, its two frontends (the console
and the Jupyter kernel's pipe), the merge of replies, the kernelspec."""
