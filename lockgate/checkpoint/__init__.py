"""lockgate.checkpoint"""
