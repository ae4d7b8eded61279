"""lockgate.runtime"""
