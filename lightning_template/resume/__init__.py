"""Exact resume: bit-exact continuation of a stopped run (see exact_resume.py for what is reproduced, and how)."""

from lightning_template.resume.exact_resume import ExactResume, ResumeCheckpoint

__all__ = ["ExactResume", "ResumeCheckpoint"]
