"""lockgate.web"""
