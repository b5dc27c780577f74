"""scaleout"""
