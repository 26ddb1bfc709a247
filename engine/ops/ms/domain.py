"""The domain name of the ops in this package."""

MS = "com.microsoft"
