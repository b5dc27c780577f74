"""tensorrt"""
