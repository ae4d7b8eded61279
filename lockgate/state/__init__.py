"""lockgate.state"""
