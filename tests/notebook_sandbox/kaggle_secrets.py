"""A stand-in for Kaggle's secret store in notebook tests: secrets are files in ``FAKE_KAGGLE_SECRETS``."""

import os


class UserSecretsClient:
    def get_secret(self, name):
        path = os.path.join(os.environ["FAKE_KAGGLE_SECRETS"], name)
        if not os.path.isfile(path):
            raise KeyError(f"no secret named {name}")
        with open(path, encoding="utf-8") as handle:
            return handle.read()
