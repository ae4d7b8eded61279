"""lockgate.cluster"""
