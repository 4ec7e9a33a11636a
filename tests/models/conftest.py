import os

# Keras 3 picks its backend when first imported: these tests run it on JAX.
os.environ["KERAS_BACKEND"] = "jax"
